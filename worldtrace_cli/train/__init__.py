"""Training the embedded world model (``loopworld``): the tiny Wan VAE and the causal DiT, on clips
of the procedural world, through the same model code and cache contract as inference."""
