"""The ring's chunks: a pure function of the buffer length and the world size."""

from hpcddp.transport.allreduce.ring import ring_bounds


def test_ring_chunks_cover_the_buffer_with_sizes_differing_by_one():
    for numel in (0, 1, 5, 16, 17):
        for parts in (1, 2, 3, 4):
            bounds = ring_bounds(numel, parts)
            sizes = [b - a for a, b in bounds]
            assert len(bounds) == parts and sum(sizes) == numel
            assert bounds[0][0] == 0 and all(bounds[k][1] == bounds[k + 1][0]
                                             for k in range(parts - 1))
            assert max(sizes) - min(sizes) <= 1
