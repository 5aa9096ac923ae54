from mtlflow.cli import main

raise SystemExit(main())
