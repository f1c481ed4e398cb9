package membership

import (
	"testing"
	"time"
)

func TestQueueDeliversInOrder(t *testing.T) {
	q := newQueue(100)
	done := make(chan struct{})
	go q.run(done, time.Now)
	defer close(done)
	for i := range 50 {
		q.push(Event{Kind: EventJoin, Member: Member{Name: string(rune('a' + i%26)), Since: time.Unix(int64(i), 0)}})
	}
	for i := range 50 {
		ev := <-q.out
		if ev.Member.Since.Unix() != int64(i) {
			t.Fatalf("event %d delivered as %d", i, ev.Member.Since.Unix())
		}
	}
}

func TestQueueDropsOldestWhenFull(t *testing.T) {
	q := newQueue(3)
	for i := range 10 {
		q.push(Event{Kind: EventUpdate, Member: Member{Since: time.Unix(int64(i), 0)}})
	}
	done := make(chan struct{})
	go q.run(done, time.Now)
	defer close(done)
	ev := <-q.out
	if ev.Kind != EventLost || ev.Lost != 7 {
		t.Fatalf("first event %v lost %d, want lost 7", ev.Kind, ev.Lost)
	}
	for i := 7; i < 10; i++ {
		if ev := <-q.out; ev.Member.Since.Unix() != int64(i) {
			t.Fatalf("got event %d, want %d", ev.Member.Since.Unix(), i)
		}
	}
}

func TestQueueClosesOnDone(t *testing.T) {
	q := newQueue(3)
	q.push(Event{})
	done := make(chan struct{})
	ran := make(chan struct{})
	go func() { q.run(done, time.Now); close(ran) }()
	close(done) // nobody reads: run must still return
	select {
	case <-ran:
	case <-time.After(5 * time.Second):
		t.Fatal("run did not return after done")
	}
	for range q.out { // drained or closed
	}
}
