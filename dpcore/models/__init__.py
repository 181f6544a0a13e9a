"""Torch modules (SNH nets, VQ-VAE) and shipped model files; device = cuda when present, else cpu."""
