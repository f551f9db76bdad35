"""The Hugging Face Hub: search, the HTTP client, resumable verified downloads and their queue."""
