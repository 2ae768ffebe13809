"""Read a ShardedLoader epoch in one of three ways and write each rank's batches as JSON.

    full OUT              the whole of epoch 1
    stop OUT STATE K      K batches, wait for prefetch to run ahead, save the state, exit
    resume OUT STATE      load the state in this new job, read the rest (on another
                          number of ranks: the state rank 0 saved, as a checkpoint has it)
"""

import json
import sys
import time

import hpcddp
from hpcddp.data import ShardedLoader

mode, out = sys.argv[1], sys.argv[2]
world = hpcddp.init()
loader = ShardedLoader(sys.argv[-1], ["y"], batch_size=6,
                       seed=4, prefetch=3)
reads = []
read = loader._reader.read
loader._reader.read = lambda idx, out=None: reads.append(len(idx)) or read(idx, out)
loader.set_epoch(1)
batches = []
if mode == "resume":
    with open(sys.argv[3]) as f:
        states = json.load(f)
    loader.load_state_dict(states[world.rank] if len(states) == world.size else states[0])
iterator = iter(loader)
for batch in iterator:
    batches.append(batch[0].tolist())
    if mode == "stop" and len(batches) == int(sys.argv[4]):
        time.sleep(0.3)  # prefetch fills its queue meanwhile
        states = world.comm.gather(loader.state_dict(), root=0)
        if world.rank == 0:
            with open(sys.argv[3], "w") as f:
                json.dump(states, f)
        break
# Rows read but not handed out (a read covers several small batches).
ahead = sum(reads) - sum(len(b) for b in batches)
everyone = world.comm.gather({"batches": batches, "read_ahead": ahead},
                             root=0)
if world.rank == 0:
    with open(out, "w") as f:
        json.dump(everyone, f)
