from paper_figures.make import main

raise SystemExit(main())
