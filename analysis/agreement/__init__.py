"""The studies of agreement with people: how far the package's scorers say what clinicians said.

They read scores and human labels (upstream's dermatologists' sheets, filled-in review workbooks) and
write tables and audits; scoring (:mod:`craftmd.scoring`) never imports them. One direction inside:

- :mod:`.review`: the review workbooks out and in, read into one typed ``ReviewInput``; resolution of two raters and
  a tie-breaker, inter-rater and grader-vs-expert agreement (the statistics themselves: :mod:`craftmd.agreement`);
- :mod:`.expert`: upstream's expert files (the dermatologists' sheets, the grader validation), the paper's
  expert figures recomputed, ``review import``;
- :mod:`.graders`: the offline FRQ grader against the recorded GPT-4 grader-AI and the dermatologists;
- :mod:`.history_validity`: the history metrics against the dermatologists' labels;
- :mod:`.judge_validity`: the rubric judge against the dermatologists' labels;
- :mod:`.rubric_review`: the rubric judge against clinicians' 1-4 ratings (workbooks out and in).
- :mod:`.calibration`: the rubric judge calibrated against those ratings (an isotonic map, held-out agreement before
  and after), and the calibrated judge written to releases;
- :mod:`.judge_sensitivity`: how far a judged release's profile moves under another judge seed, dimension order,
  judge model or prompt wording.
"""
