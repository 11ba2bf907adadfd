"""``python -m curvecast.client sync [DIR]``: ``curvecast sync`` without the server extras."""

import sys

from curvecast.client.sync import main

sys.exit(main())
