"""``close_all`` closes newest first, also where an owner reuses a dead one's address.

Ranks close collective owners (MPI-IO files, duplicated communicators) in registry
order, so that order must be the order of registration on every rank, whatever
addresses each rank's allocator handed out.
"""

from hpcddp.comm import lifetime


class Owner:
    closed = []

    def __init__(self, name):
        self.name = name

    def close(self):
        Owner.closed.append(self.name)
        lifetime.unregister(self)


def test_an_owner_at_a_dead_owners_address_is_closed_as_the_newest():
    Owner.closed.clear()
    dead = Owner("dead")
    lifetime.register(dead)  # weakly: it dies without close()
    kept = Owner("kept")
    lifetime.register(kept, keep_alive=True)
    address = id(dead)
    del dead
    misses = []  # held, so that each try gets a fresh address
    newest = Owner("newest")
    while id(newest) != address and len(misses) < 10_000:
        misses.append(newest)
        newest = Owner("newest")
    assert id(newest) == address, "precondition: CPython gives a freed object's address to the next"
    lifetime.register(newest, keep_alive=True)
    del newest, misses
    lifetime.close_all()
    assert Owner.closed == ["newest", "kept"]
    assert lifetime.open_count() == 0


class Failing(Owner):
    def close(self):
        super().close()
        raise OSError(9, "Bad file descriptor")


def test_an_owner_that_fails_to_close_does_not_keep_the_older_ones_open():
    # Every rank closes its owners collectively: one that raises on this rank must not
    # leave the rest open here while the other ranks wait in their close().
    import pytest

    Owner.closed.clear()
    for owner in (Owner("oldest"), Failing("failing"), Owner("newest")):
        lifetime.register(owner, keep_alive=True)
    with pytest.raises(OSError, match="Bad file descriptor"):
        lifetime.close_all()
    assert Owner.closed == ["newest", "failing", "oldest"]
    assert lifetime.open_count() == 0
