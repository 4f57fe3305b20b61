"""What every tab shares: theme, glossary, a browser session's runs, the one-decode slot, hosting."""
