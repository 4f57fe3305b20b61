"""The Generate tab: controls, the handlers that run a decode, and the views of one trace."""
