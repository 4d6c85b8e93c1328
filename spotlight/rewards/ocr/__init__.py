"""The OCR reward: text read back from an image, and the rendered scenes that check it."""
