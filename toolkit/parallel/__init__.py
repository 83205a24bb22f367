"""Parallelism the run half adds to HF models: DeepSpeed-MoE experts, pipeline stages, 1-bit optimizers."""
