"""`python -m dsv4` is the `dsv4` command."""
from dsv4.cli import main

raise SystemExit(main())
