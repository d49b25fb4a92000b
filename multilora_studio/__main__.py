import sys

from multilora_studio.cli import main

sys.exit(main())
