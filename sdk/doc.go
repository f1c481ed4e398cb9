// Package sdk is the Go client of rewind, called from a training loop.
//
//	c, err := sdk.Dial(ctx, sdk.DefaultSocket)
//	s, err := c.Session("llama-70b", rank, worldSize)
//	err = s.Save(ctx, step, tensors, objects) // returns once the bytes are committed in shared memory
//	ckpt, err := s.Restore(ctx)                // the rank's latest committed step, verified
//
// Save copies tensors straight into a shared-memory segment mapped into the
// process and computes their checksums in the same pass; the mapping is kept
// and reused by later saves, so a warm save costs about one memcpy. Every
// call to the agent has a deadline; errors wrap one of the Err values of this
// package and carry the agent's message.
package sdk
