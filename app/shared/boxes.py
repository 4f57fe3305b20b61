"""The page's sliders and choice controls, as Gradio's own but with what they refuse said in words.

`Bounded`: a slider whose number box refuses a value outside the slider's range with a sentence naming the box and
the range, shown where the tab shows its other refusals (Gradio's own raised a bare "Value 100 is greater than
maximum value 2.0" with a traceback in the server log, and its number box then clamped what was typed on blur, so
Run ran T = 2 for a typed 100, greedy for −1; theme.PAGE_JS keeps the typed value, so Run is refused rather than run
on a value nobody typed). The value reaches the handler as OutOfRange; `refuse_out_of_range` raises the tab's
OptionsError with its sentence.

`Choice` and `ChoiceDropdown`: radios and dropdowns whose choices follow other controls (the Generate tab narrows a
drafter's or a tree source's choices to the target's). One pick in the target dropdown sends its event twice at once;
the first reply narrows the choices on the server, and the second, still carrying the old value, was refused
before any handler ran (`Value: 'draft-model' is not in the list of choices: ['auto']` in the server log, the update
lost). These pass a value the current choices no longer hold to the handler, which moves it to an offered choice
(controls.control_states) or refuses a run with a message (decoders/options.py validation, hosting's allow list).
"""
from __future__ import annotations

import gradio as gr

from decoders.options import OptionsError


def range_message(label: str, value, low, high) -> str | None:
    """The sentence for a value outside [low, high] (None when it is inside, or when there is no number to judge)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    if number != number:  # NaN: the browser sends it for an unparsable box; Gradio's own checks never catch it
        return f"{label} must be a number from {_num(low)} to {_num(high)}; the box holds no number"
    if low is not None and number < low or high is not None and number > high:
        return (f"{label} must be from {_num(low)} to {_num(high)}, got {_num(number)}: type a value in that range "
                f"or drag the slider")
    return None


def _num(value) -> str:
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


class OutOfRange(float):
    """A number typed into a Bounded box outside its range, carried to the handler with the sentence that refuses it
    (a float, so a handler that forgot to check would still see the number typed, never a clamped one)."""

    message: str

    def __new__(cls, value: float, message: str) -> "OutOfRange":
        number = super().__new__(cls, value)
        number.message = message
        return number


def refuse_out_of_range(values) -> None:
    """Raise OptionsError with the first out-of-range box's sentence: each tab's run handler calls it where it
    already turns OptionsError into its error panel (as it does for max new tokens)."""
    for value in values:
        if isinstance(value, OutOfRange):
            raise OptionsError(value.message)


class Bounded(gr.Slider):
    """gr.Slider whose number box refuses an out-of-range value in words, through the run handler's error panel."""

    def get_block_name(self) -> str:  # drawn by Gradio's own slider
        return "slider"

    def preprocess(self, payload):
        label = self.label or "this value"
        if payload is None:  # an emptied box (the browser sends no number)
            return OutOfRange(float("nan"), f"{label} is empty: type a number from {_num(self.minimum)} to "
                                            f"{_num(self.maximum)}")
        message = range_message(label, payload, self.minimum, self.maximum)
        if message is not None:
            return OutOfRange(float(payload), message)
        return super().preprocess(payload)


SCRUB = ["sl-scrubber"]  # a Scrubber's class: the page JS leaves its box to Gradio's clamp


class Scrubber(gr.Slider):
    """A slider that picks a position in a finished run (a round, a step): a number typed past either end means that
    end, as dragging there would (Gradio's own raised an Error with a traceback in the server log). The page JS
    leaves its box to Gradio's clamp (class sl-scrubber, which each call site passes: an __init__ of its own kept
    Gradio's page from drawing the slider at all)."""

    def get_block_name(self) -> str:
        return "slider"

    def preprocess(self, payload):
        if payload is None:
            return self.minimum
        try:
            number = float(payload)
        except (TypeError, ValueError):
            return self.minimum
        return super().preprocess(min(max(number, self.minimum), self.maximum))


class Choice(gr.Radio):
    """gr.Radio whose handler also receives a value its current (narrowed) choices no longer hold."""

    def get_block_name(self) -> str:
        return "radio"

    def preprocess(self, payload):
        if payload is not None and payload not in [value for _, value in self.choices]:
            return payload  # a reply narrowed the choices while this event was in flight: the handler decides
        return super().preprocess(payload)


class ChoiceDropdown(gr.Dropdown):
    """gr.Dropdown whose handler also receives a value its current (narrowed) choices no longer hold."""

    def get_block_name(self) -> str:
        return "dropdown"

    def preprocess(self, payload):
        if isinstance(payload, str) and payload not in [value for _, value in self.choices]:
            return payload
        return super().preprocess(payload)
