import sys

from tests.guide.guide import main

sys.exit(main())
