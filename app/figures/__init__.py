"""Figures and HTML views (pure: traces in, plotly figures and HTML out; no torch, no models, no gradio)."""
