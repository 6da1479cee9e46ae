"""The main stage of `evald run`: the session and its poll cycle, the inputs merged in
timestamp order, the engine fed and ticked, the commit cycle (results, dead letters,
checkpoints, statistics shares in one transaction) and the restore from checkpoints.
(The other stage, the re-keying of feedback by request id, is ``daemon/repartition/``.)"""
