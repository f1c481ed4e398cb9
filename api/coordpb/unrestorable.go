package coordpb

// StoreDidNotServe reports whether a step was passed over only because a
// store did not serve copies of it: every rank that failed had a copy
// whose store did not answer (CopyFailure.unreachable), so the step may
// restore once the store is back, and is not marked unrestorable.
func (u *UnrestorableStep) StoreDidNotServe() bool {
	if len(u.GetRanks()) == 0 {
		return false
	}
	for _, r := range u.Ranks {
		unreachable := false
		for _, c := range r.Copies {
			unreachable = unreachable || c.Unreachable
		}
		if !unreachable {
			return false
		}
	}
	return true
}
