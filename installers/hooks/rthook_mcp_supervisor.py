"""PyInstaller runtime hook (installers/glassbox.spec): ``glassbox --glassbox-mcp-supervisor PARENT -- COMMAND
[ARGS...]`` runs the Linux parent of a stdio MCP server (``engine.agent.mcp_supervisor``, standard library only)
and exits, before anything else of the app is imported.

In the frozen app ``sys.executable`` is Glassbox itself, not Python, so this is how
``engine.agent.mcp_stdio`` starts the supervisor on a machine without Python. Any other start costs one
comparison.
"""

import sys

if sys.argv[1:2] == ["--glassbox-mcp-supervisor"]:
    from engine.agent.mcp_supervisor import main

    sys.exit(main(sys.argv[2:]))
