"""``glassbox serve``: the HTTP server and its wire formats (OpenAI's, Anthropic's), Qt-free.

:mod:`app.server.http` holds the server (start, stop, routing); :mod:`app.server.wire` the OpenAI
wire documents. Importing this package imports nothing heavy.
"""
