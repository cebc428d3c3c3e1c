import sys

from tests.cluster.testcluster import main

sys.exit(main())
