"""Print this rank's World as one line of key=value pairs."""

import hpcddp

world = hpcddp.init()
print(f"rank={world.rank} size={world.size} local_rank={world.local_rank} "
      f"device={world.device}", flush=True)
