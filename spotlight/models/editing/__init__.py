"""Instruction-based image editing (FLUX.1 Kontext, Qwen-Image-Edit): what an edit pipeline folder adds to the image
pipelines' code.

A sample is a dataset row, an instruction and the source image it edits, carried through the loop as one
string (`spotlight.data.edit_key`); the source image's latents ride in the row's conditioning
(`PromptEmbeddings.image`), encoded once per row and cached beside its text embeddings (`condition`).
Qwen-Image-Edit's text encoder reads the source too (`condition.text_encoder_images`), through transformers'
processor built without torchvision (`qwen_processor`).
"""
