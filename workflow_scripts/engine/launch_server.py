"""`python -m workflow_scripts.engine.launch_server`: the entry point the launcher and docs/embedded_engine.md name.

The start-up itself lives in the front package (`workflow_scripts.server.launch_server`).
"""

import sys

from workflow_scripts.server.launch_server import main

if __name__ == "__main__":
    sys.exit(main())
