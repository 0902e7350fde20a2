"""gravac.torch lets a process exit while torch's threads still hold a collective's tensors.

torch releases a collective's tensors on its own threads (Gloo's workers, NCCL's watchdog)
a little after the collective returns, and releasing one made in Python takes the GIL. A
thread that takes the GIL after the interpreter has begun to finalize is ended inside a C++
destructor and the process aborts. gravac.torch watches what its callbacks hand to torch and
waits at exit until torch has let go (_HeldByTorch).

The check makes the late release certain instead of rare: rank 0 starts an all_reduce on a
tensor over C memory (as gravac's callbacks make them) and exits at once; rank 1 joins the
collective 1.5 s later, so Gloo's worker on rank 0 finishes it, and releases the tensor,
while rank 0 is exiting. Both ranks must exit with 0, and rank 0 must have waited for it.

    /usr/bin/python3 tests/torch/exit_release_check.py

Exits 77 (skipped) when torch or gravac.torch cannot be imported.
"""
import ctypes
import os
import subprocess
import sys
import tempfile
import time

LATE_S = 1.5


def rank_main(rank, store_path, control):
    import torch
    import torch.distributed as dist
    import gravac.torch as gt

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    if rank == 1:
        time.sleep(LATE_S)
        dist.all_reduce(torch.ones(256))
        return
    if control:  # nothing watched: what torch does without gravac's wait
        gt._held_by_torch.track = lambda *objects: None
    global _memory  # the C memory must outlive the collective: kept until the process ends
    _memory = (ctypes.c_float * 256)()
    t = gt._host_tensor(ctypes.addressof(_memory), ctypes.sizeof(_memory), torch.float32)
    dist.all_reduce(t, async_op=True)  # the work and the tensor dropped: only Gloo holds them
    if gt._held_by_torch.count() == 0 and not control:
        raise SystemExit("exit_release_check: the tensor handed to torch is not watched")


def run_pair(control):
    """Both ranks' exit codes and rank 0's seconds from start to exit."""
    with tempfile.TemporaryDirectory() as work:
        store = os.path.join(work, "store")
        start = time.monotonic()
        # The control's abort message would read as this check's failure: it is not shown.
        quiet = subprocess.DEVNULL if control else None
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), store] + (["--control"] if control else []),
                                  stderr=quiet)
                 for r in (0, 1)]
        codes, elapsed = [], []
        for p in procs:
            codes.append(p.wait(timeout=120))
            elapsed.append(time.monotonic() - start)
        return codes, elapsed[0]


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--rank":
        rank_main(int(sys.argv[2]), sys.argv[3], "--control" in sys.argv)
        return 0
    try:
        import torch  # noqa: F401
        import gravac.torch  # noqa: F401
    except ImportError as e:
        print(f"exit_release_check: skipped: {e}")
        return 77
    codes, rank0_s = run_pair(control=False)
    print(f"exit_release_check: exit codes {codes}; rank 0 exited after {rank0_s:.2f} s "
          f"(rank 1 joined {LATE_S} s late)")
    if codes != [0, 0]:
        print("exit_release_check: FAILED: a rank did not exit cleanly")
        return 1
    if rank0_s < LATE_S:
        print("exit_release_check: FAILED: rank 0 exited before torch had let go of its tensor")
        return 1
    # Not asserted (it is torch's behaviour, and may change): the same without the wait.
    control_codes, _ = run_pair(control=True)
    print(f"exit_release_check: without the wait, exit codes {control_codes} (negative: a signal)")
    print("exit_release_check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
