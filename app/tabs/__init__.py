"""The page's tabs: one module or package per tab (layout and handlers together)."""
