"""The wire library the master and the worker programs share: the job and
protocol rules (``protocol``), canonical identifiers (``canonical``), the PDF
check both sides run (``pdfcheck``), the source file format (``source``,
``jobs-jsonl-zstd-v1``) and private secret files (``private_file``)."""
