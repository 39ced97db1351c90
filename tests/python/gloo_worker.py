"""A PyTorch worker for launcher tests: init_process_group("gloo") from the env, then collectives."""
import datetime
import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()
assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])
t = torch.tensor([float(rank + 1)] * 4)
dist.all_reduce(t)
expected = world * (world + 1) / 2
assert t.tolist() == [expected] * 4, t
gathered = [torch.zeros(2) for _ in range(world)]
# Every tensor given to a collective stays referenced here until destroy_process_group: PyTorch 2.6
# can deadlock there otherwise (ProcessGroupGloo's destructor joins its worker thread while holding
# the GIL, and that thread, freeing the last reference to a temporary's tensor, waits for the GIL).
mine = torch.tensor([rank, rank * 10.0])
dist.all_gather(gathered, mine)
assert [g.tolist() for g in gathered] == [[r, r * 10.0] for r in range(world)], gathered
dist.barrier()
print(f"rank {rank} ok {expected} attempt {os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "fail-first-attempt" and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3 if rank == 1 else 0)
dist.destroy_process_group()
