"""Running a model: the llama.cpp runtime, sessions, templates, the context budget, events,
backends (local and OpenAI-compatible remote), tool-call parsing and the decode loop."""
