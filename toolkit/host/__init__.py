"""What the machine dstk runs on says about itself (nvidia-smi, /proc, sysfs), the cluster description made of
it for `--cluster local`, and the calibration cache. Pure (no torch): the planner never imports this folder —
it reads descriptions; the verbs and the run half hand it what was detected."""
