"""The run half: models, the training loop in the DeepSpeed engine, checkpoints, export, calibration probes."""
