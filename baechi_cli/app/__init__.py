"""The work behind each command, as functions that return outcomes and never print: ``place``
(:mod:`.place`), ``compare`` (:mod:`.compare`), ``profile`` (:mod:`.profile`), ``devices calibrate``
(:mod:`.calibrate`), and what they share: the JSON report (:mod:`.report`), the notes a summary
shows (:mod:`.notes`) and the place outcome (:mod:`.outcome`).
"""
