"""The text of SSML, for the Wyoming server: a Synthesize (or SynthesizeStart) whose `text_format`
is "ssml" is spoken as the text its elements hold, the markup dropped, as a reader would say it.

    reader = SsmlText()
    reader.feed('<speak>Hello <break time="1s"/>there &amp; ')   # -> "Hello  there & "
    reader.feed("welcome.</speak>", final=True)                  # -> "welcome. "

OmniVoice reads plain text; it has no prosody, pause or pronunciation controls that SSML's tags
could map to, so reading the tags aloud (what a plain-text server does) is the one wrong answer.
What is kept: every element's text, CDATA sections as text, the five XML entities and numeric
character references decoded; `<sub alias="...">` speaks its alias (SSML's substitution); `<desc>`
(the description of an `<audio>` clip, never spoken) is dropped; `<break>`, `<p>`, `<s>` and
`<speak>` separate words. Everything else's markup (attributes, comments, processing instructions)
is dropped, its text read.

The parser is expat (the standard library's), fed piece by piece as streamed chunks arrive, with
every DTD refused at its first byte: no internal entity can be declared (no "billion laughs"
expansion), no external entity or DTD is ever fetched (no XXE), and an entity no DTD declares is a
well-formedness error. What is not well-formed XML is refused with one line (expat's reason and
position), never read aloud.
"""

from __future__ import annotations

from xml.parsers import expat

from omnivoice_onnx.serve.door import refuse

TEXT_FORMATS = ("text", "ssml")  # Synthesize's `text_format` values (wyoming.tts.SynthesizeTextFormat)
SEPARATING = frozenset({"break", "p", "s", "speak"})  # elements whose edges separate words
SILENT = frozenset({"desc"})  # elements whose text is never spoken


class _Refused(Exception):
    """Raised inside expat's callbacks: the document declares a DTD (refused, see the module)."""


def local_name(tag: str) -> str:
    """An element's name without its namespace prefix ("ssml:break" -> "break")."""
    return tag.rsplit(":", 1)[-1]


class SsmlText:
    """One SSML document, read in pieces (feed), giving its spoken text as it comes."""

    def __init__(self) -> None:
        self.parser = expat.ParserCreate()
        self.parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
        self.parser.StartDoctypeDeclHandler = self._doctype
        self.parser.CharacterDataHandler = self._text
        self.parser.StartElementHandler = self._start
        self.parser.EndElementHandler = self._end
        self.out: list[str] = []
        self.quiet = 0  # open elements whose text is not spoken (SILENT, or a <sub> with its alias said)
        self.quieting: list[bool] = []  # per open element: whether it raised `quiet`

    def _doctype(self, *_: object) -> None:
        raise _Refused()

    def _text(self, data: str) -> None:
        if not self.quiet:
            self.out.append(data)

    def _start(self, tag: str, attributes: dict[str, str]) -> None:
        name = local_name(tag)
        if name in SEPARATING:
            self.out.append(" ")
        alias = attributes.get("alias") if name == "sub" else None
        if alias is not None and not self.quiet:
            self.out.append(alias)
        quieting = name in SILENT or alias is not None
        self.quiet += quieting
        self.quieting.append(quieting)

    def _end(self, tag: str) -> None:
        self.quiet -= self.quieting.pop()
        if local_name(tag) in SEPARATING:
            self.out.append(" ")

    def feed(self, data: str, final: bool = False) -> str:
        """The spoken text `data` completes (all that is left when `final`); ApiError (400, one
        line) for what is not well-formed XML, or declares a DTD."""
        try:
            self.parser.Parse(data, final)
        except _Refused:
            raise refuse(
                "invalid_value", detail="text_format ssml: a DOCTYPE (DTD) is refused; send SSML without one"
            ) from None
        except expat.ExpatError as exc:
            raise refuse(
                "invalid_value", detail=f"text_format ssml: not well-formed XML ({exc}); send SSML or plain text"
            ) from None
        text, self.out = "".join(self.out), []
        return text


def spoken_text(ssml: str) -> str:
    """The whole document's spoken text, its runs of whitespace one space."""
    return " ".join(SsmlText().feed(ssml, final=True).split())
