from workflow_scripts.engine.ngram import propose


def test_longest_latest_match_continues():
    seq = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1, 2, 3]
    # suffix [1, 2, 3] last occurred at the start, followed by 9, 9, 7
    assert propose(seq, 3) == [9, 9, 7]
    # [1, 2] matches at 0 (-> 5, 6); [2] alone matches later at 4 (-> 7, 1): the longer match wins
    assert propose([1, 2, 5, 6, 2, 7, 1, 2], 2) == [5, 6]
    assert propose([5, 3, 4, 8, 3], 2) == [4, 8]  # falls back to a 1-gram


def test_no_match_or_short_tail():
    assert propose([1, 2, 3, 4], 3) == []
    assert propose([7], 3) == []
    assert propose([1, 2, 1, 2], 5) == [1, 2]  # only what exists after the match
