"""Diffusers pipeline families (SD3, FLUX, Qwen-Image): folders, loading, inputs, the LoRA policy, tiny pipelines."""
