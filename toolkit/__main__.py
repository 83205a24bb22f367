"""`python -m toolkit ARGS` and `python PATH/TO/toolkit/__main__.py ARGS` are `dstk ARGS`.

The second form is for DeepSpeed's slurm backend, which starts `srun ... python SCRIPT ARGS` on every task
and ignores `--module` (toolkit.launcher.command.RANK_SCRIPT). Run as a script, this file's folder heads
`sys.path`; it is not an import root (its `data`, `run`, `plan` would shadow other packages), so it goes.
"""

import sys

if __name__ == "__main__":
    if __spec__ is None:  # run by path, not with -m
        sys.path.pop(0)
    from toolkit.cli import main

    sys.exit(main())
