// Package stomp is a small STOMP 1.2 client: a frame codec ([Frame], [Decoder]) and a connection
// ([Conn]) that sends with receipts, subscribes with client-individual acknowledgement and
// heart-beats in both directions. It is the building block of the message port's STOMP provider,
// tested against ActiveMQ Classic; it holds no retry, dead-letter or supersession rule of the
// port (those belong to pkg/mq).
//
// It is ours because no STOMP client module is served by the module proxy these machines use;
// it is kept to what the port needs.
package stomp
