"""Glassbox documents: loaders, chunking, embeddings, the Chroma store and retrieval, headless (no Qt)."""
