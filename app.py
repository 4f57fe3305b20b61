"""SpecLab: watch speculative decoding think. `python app.py` (or `make demo`) serves the app.

Honours GRADIO_SERVER_NAME / GRADIO_SERVER_PORT (Gradio reads them itself); on a Hugging Face Space this file is
the app_file and the Space runs it as is.
"""
from app.page import build_demo, launch_kwargs

demo = build_demo()

if __name__ == "__main__":
    demo.queue(max_size=32).launch(**launch_kwargs())
