"""Glassbox engine: everything about models, headless (no Qt)."""
