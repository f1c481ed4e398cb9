package coordpb

// EventSeqHeader is the header of a WatchJob stream that carries the seq
// of the last event the coordinator had published when the watch began
// (decimal): a follower starts from it, so that a later replay gives it
// only what it missed.
const EventSeqHeader = "rewind-event-seq"
