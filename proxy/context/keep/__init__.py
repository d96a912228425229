"""What the proxy writes into a summary item itself, exactly from the log: the artifact trail, the files in hand,
the literals, the pins, the user's words."""
