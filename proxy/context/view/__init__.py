"""What is sent and its tiers: the budget and token counts, the projection, masking, clipping, which checkpoint
applies."""
