"""``python -m client sync [DIR]``: ``curvecast sync`` without the server extras installed."""

import sys

from curvecast.client._cli import main

sys.exit(main())
