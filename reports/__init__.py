"""Reports built from run folders alone: tidy frames, tables, scaling fits, charts, the HTML
page, and run-to-run comparison."""
