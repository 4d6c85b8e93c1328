"""Transformer, text-encoder and VAE counts computed from config.json numbers, with no model built."""
