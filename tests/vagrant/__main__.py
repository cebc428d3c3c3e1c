import sys

from tests.vagrant.vagrantcluster import main

sys.exit(main())
