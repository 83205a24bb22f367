"""What dstk writes for other tools: DeepSpeed JSON, HF Trainer, Accelerate, Megatron-DeepSpeed; validation."""
