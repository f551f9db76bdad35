"""The agent loop over a chat backend, its built-in tools and the MCP client."""
