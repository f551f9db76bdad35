"""PyInstaller runtime hook (installers/glassbox.spec): ``glassbox --self-test-mcp-server`` runs the
self-test's stdio MCP server and exits, before the app's command line is parsed.

In the frozen app ``sys.executable`` is Glassbox itself, not Python, so this is how the self-test
(``app.gui.selftest``, whose ``MCP_SERVER_FLAG`` is this flag) starts a real stdio server on a
machine without Python. Any other start costs one comparison.
"""

import sys

if sys.argv[1:] == ["--self-test-mcp-server"]:
    from app.gui.selftest import serve_self_test_mcp_server

    serve_self_test_mcp_server()
    sys.exit(0)
