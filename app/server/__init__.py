"""``glassbox serve``: the HTTP server and its wire formats (OpenAI's, Anthropic's), Qt-free.

:mod:`app.server.http` starts and stops the server; :mod:`app.server.handler` routes requests;
:mod:`app.server.exchange` is what every endpoint is given (bodies, the model queue, server-sent
events); one module per endpoint (:mod:`~app.server.chat`, :mod:`~app.server.completions`,
:mod:`~app.server.embeddings`, :mod:`~app.server.responses`, :mod:`~app.server.messages`,
:mod:`~app.server.models`), the chat turn the dialects share in :mod:`~app.server.turn`; the OpenAI
chat documents in :mod:`~app.server.wire`, the shared request fields in :mod:`~app.server.params`,
hostile bodies in :mod:`~app.server.body`, errors in :mod:`~app.server.errors`, server-sent events
in :mod:`~app.server.sse`, shared state in :mod:`~app.server.state`. Importing this package imports
nothing heavy.
"""
