"""Video diffusion (Wan2.1 text-to-video, Wan2.2 A14B's two experts): what a video pipeline folder adds to the image
pipelines' code."""
