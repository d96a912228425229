from __future__ import annotations

from proxy.context.summary.chunking import Block, plan_chunk


def chars(text: str) -> int:
    return len(text)


def blocks(*sizes: int) -> list[Block]:
    return [Block("x" * size, size) for size in sizes]


def sizes(chunk: list[Block]) -> list[int]:
    return [block.tokens for block in chunk]


def test_what_fits_is_one_chunk() -> None:
    assert plan_chunk(blocks(3, 3, 3), 11, chars) == (blocks(3, 3, 3), [])


def test_chunks_are_balanced_not_greedy() -> None:
    # 10 blocks of 543 (5,439 with the newlines) in room for 4,500: two of about 2,720, not 4,343 and 1,087.
    chunk, rest = plan_chunk(blocks(*[543] * 10), 4_500, chars)
    assert (len(chunk), len(rest)) == (5, 5)
    assert plan_chunk(blocks(*[543] * 10), 6_000, chars) == (blocks(*[543] * 10), [])


def test_the_block_that_crosses_the_target_goes_where_the_cut_is_nearer() -> None:
    # 10 in all with the newlines, target 5 (limit 8): 4 + 1 + 2 = 7 is 2 over, 4 is 1 under: stop before it.
    assert sizes(plan_chunk(blocks(4, 2, 2), 8, chars)[0]) == [4]
    # 9 in all, target 5 (limit 6): 2 + 1 + 3 = 6 is 1 over, 2 is 3 under: take it.
    assert sizes(plan_chunk(blocks(2, 3, 2), 6, chars)[0]) == [2, 3]


def test_a_block_over_the_limit_is_cut_in_equal_pieces_only_the_last_marked_last() -> None:
    pending = [Block("y" * 10_000, 10_000), Block("z", 1)]
    chunks = []
    while pending:
        chunk, pending = plan_chunk(pending, 4_500, chars)
        chunks.append([(block.tokens, block.last) for block in chunk])
    assert chunks == [[(3_334, False)], [(3_333, False)], [(3_333, True), (1, True)]]


def test_a_block_is_not_cut_when_a_whole_one_comes_first() -> None:
    chunk, rest = plan_chunk(blocks(1_000, 9_000), 4_500, chars)
    assert sizes(chunk) == [1_000] and sizes(rest) == [9_000]


def test_a_dense_piece_shrinks_until_it_fits() -> None:
    text = "a" * 100 + "b" * 100  # "b" counts 3 tokens a character: the proportional cut would overflow

    def dense(part: str) -> int:
        return part.count("a") + 3 * part.count("b")

    piece, rest = plan_chunk([Block(text, dense(text))], 200, dense)
    assert piece[0].tokens <= 200 and not piece[0].last
    assert piece[0].text + rest[0].text == text and rest[0].last
