"""Video diffusion (Wan2.1 text-to-video): what a video pipeline folder adds to the image pipelines' code."""
