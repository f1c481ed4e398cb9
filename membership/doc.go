// Package membership owns cluster membership and failure detection for
// rewind's agents and coordinator, on hashicorp/memberlist (SWIM with the
// Lifeguard extensions): who is in the cluster, in which failure domain,
// with which gRPC address, and who is alive, suspected or dead.
//
// Each process runs one Members. Its view changes arrive on Events in the
// order it saw them; Members returns the whole view. DefaultConfig is tuned
// for fast detection on a LAN and documents the bound it gives (a crashed
// member of a cluster of up to 10 is declared dead within 2 s, with
// probability 95%). The partition rule the coordinator follows before
// acting on a death is documented with HasQuorum and CheckQuorum in
// quorum.go. FaultNetwork cuts and slows links between members, for tests
// of partitions and slow nodes without root.
package membership
