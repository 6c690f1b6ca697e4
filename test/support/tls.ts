/**
 * An https receiver on loopback for outbound-request tests (webhooks): a certificate for
 * `receiver.test`, `localhost`, 127.0.0.1 and ::1, signed by a test CA that the tests trust
 * explicitly (`TEST_CA`, or NODE_EXTRA_CA_CERTS for server processes). Fixed PEMs made with
 * openssl (valid until 2126), so no test needs openssl or the network. Every request is recorded
 * (method, path, headers, raw body, arrival time) before the test's handler answers it.
 */
import { createServer, type Server } from 'node:https';
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';

export const TEST_CA = `-----BEGIN CERTIFICATE-----
MIIDKzCCAhOgAwIBAgIUHucna9+U6cTMhjF8jFWvA1bL3jIwDQYJKoZIhvcNAQEL
BQAwHDEaMBgGA1UEAwwRTWVkaWFnYXRlIHRlc3QgQ0EwIBcNMjYxMTIzMTI1OTU4
WhgPMjEyNjEwMzAxMjU5NThaMBwxGjAYBgNVBAMMEU1lZGlhZ2F0ZSB0ZXN0IENB
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAlLdrB46V7btz0FGoWS01
YkhaZwNJbsMf6FIpQ+Nk+ClOVeG8BUxDyzHDG6nmdA3NHg48xQT7cevww8dvcpyE
b5aWF5P7t4toBE5dV/DorGRhW4mnuqWhPrnJOBnVl4djPqJk2klnJmVrlxtpfw6b
hoEHuqBjXMUIpz9zTSMzf4SIzYKNS7iCrmZJXVnTpb9ao7NQjLpm+qzCE5KPZkwF
onnndZYqhTokydFSMo/k/d0uURX3GnVYcehegq4BL0BU78kDTvNNnbRxoC/VGFg7
wUkNqpZlkROQ5NBC9c5r0f1AKFfH13gIrHPxB8sD/qAHoBf9MnA6X8s6XjKdlw+U
xwIDAQABo2MwYTAdBgNVHQ4EFgQUbWEGsLO2p5qSeARU+RcD2uE3gtwwHwYDVR0j
BBgwFoAUbWEGsLO2p5qSeARU+RcD2uE3gtwwDwYDVR0TAQH/BAUwAwEB/zAOBgNV
HQ8BAf8EBAMCAQYwDQYJKoZIhvcNAQELBQADggEBACZzdz/E8uPclSpaXVEhUvsI
/y+PtTZbNnSHkQQNs8GbCUVD994FFeEL+9p4GgizY3d/el+vqepkQoUESP4dIoZP
3kQ8+CS2sNAu2E/0HugZ1HIiaZntxYnY7TgSDwA9YKLC4uosBT1mgK3QcjjFI+vA
O2KF4iO8IQr80YaqocW+EKWj7h47P7W5ZD5DvVuY+6Bd7Nks3ceG5qVOLzQed+vt
CXGY13pZb6918V8rh6Hy+4KKIhjj14RDx+3lvGoiqTdjLy0b2Et99+FGKrKo3a36
p0sG7iiq45fiOB7wR06W46r3cIB6gOXm8i/wsLjnXtL0Fg2nv8Z7GDvziuHcJhg=
-----END CERTIFICATE-----
`;

const CERT = `-----BEGIN CERTIFICATE-----
MIIDZTCCAk2gAwIBAgIUdFv8Ljth2jIBuLhJUI98965wusEwDQYJKoZIhvcNAQEL
BQAwHDEaMBgGA1UEAwwRTWVkaWFnYXRlIHRlc3QgQ0EwIBcNMjYxMTIzMTI1OTU4
WhgPMjEyNjEwMzAxMjU5NThaMBgxFjAUBgNVBAMMDXJlY2VpdmVyLnRlc3QwggEi
MA0GCSqGSIb3DQEBAQUAA4IBDwAwggEKAoIBAQDcIgesBOM7x67a4Etv+b9oXGTx
ZBVo2mnby+9sj3diKQQS87NjfhC6E7F0u93qZ2wi6qBBHmZ/F/KTAP13GsQRreXf
tAd3vZT3lNNpO/t0KE72X+yPT8cxOz/EAq8/D+CgeoCdfORUgzYA608IL9v8gU6a
uiPNwSFFUGa1GXDtN0BFxkriAZIFlWw87Yjj2gSuHJ+TmeLGMQP5bVl7f+yJLBt2
8t0QcVGZ7KxMFDQtCi0/SH8gmvqdXuDdGqHS54aJS1j36zfOWinQWSq6xbqDBzzk
W3G2cJK4Uc1kIilaTuVPIOJeODmTXkopL21X0xuUw8Th19RcF5QSn+rLk0jtAgMB
AAGjgaAwgZ0wOwYDVR0RBDQwMoINcmVjZWl2ZXIudGVzdIIJbG9jYWxob3N0hwR/
AAABhxAAAAAAAAAAAAAAAAAAAAABMAkGA1UdEwQCMAAwEwYDVR0lBAwwCgYIKwYB
BQUHAwEwHQYDVR0OBBYEFArsTGuFVHLE62UejtB5Lht8q/PwMB8GA1UdIwQYMBaA
FG1hBrCztqeakngEVPkXA9rhN4LcMA0GCSqGSIb3DQEBCwUAA4IBAQATbLDMBbz/
fozzkeCeU48Np7R7gvxJfNbXZMrEKhNN67A7xd8sTBqM1Y28735ffHtZ+s0XCCtg
gSe9lV0gYqoHK4PMpQZn8zGnHVpYUALu6UM+vqKSvtAQslRSgcErRLnDT7BO8eWe
ix4JMklTCq+VjnRQ9QLUPX/zc1FLS7sTkyw83KsUhr76Mzi4WKLPRA8knhLJbw4m
WK3VclAnklaVm4GrS3emTigRJ51YiLQBjAGXn/gZbQaQqZUTO0eLFgbCCBJxQy6+
zJiHHexTw9bx87wUIaybieBLFWaBAQ6cjkxRVNvg1VAjHkyxgSFsmvlMnrO4ce2U
0xebMxfWFtXA
-----END CERTIFICATE-----
`;

const KEY = `-----BEGIN PRIVATE KEY-----
MIIEvgIBADANBgkqhkiG9w0BAQEFAASCBKgwggSkAgEAAoIBAQDcIgesBOM7x67a
4Etv+b9oXGTxZBVo2mnby+9sj3diKQQS87NjfhC6E7F0u93qZ2wi6qBBHmZ/F/KT
AP13GsQRreXftAd3vZT3lNNpO/t0KE72X+yPT8cxOz/EAq8/D+CgeoCdfORUgzYA
608IL9v8gU6auiPNwSFFUGa1GXDtN0BFxkriAZIFlWw87Yjj2gSuHJ+TmeLGMQP5
bVl7f+yJLBt28t0QcVGZ7KxMFDQtCi0/SH8gmvqdXuDdGqHS54aJS1j36zfOWinQ
WSq6xbqDBzzkW3G2cJK4Uc1kIilaTuVPIOJeODmTXkopL21X0xuUw8Th19RcF5QS
n+rLk0jtAgMBAAECggEAFZHxEgJFmN87az+UrMN6Zbm9+2hM78INIug0DP1u24u8
1jWSg6J/9ZfF6PQareQV9MLsUo0tynDYiF6Nt5zEDx5s2rN7kthdDziCUbq6rDph
6GLkXXOaB2EwoZ6IuQNvhZITZbst7XkQ8tyb2SfFZNPv1Zn9NaVhwva6pa65Qckc
XJ4kHaWGwvJPnSnesMtgTrGZ0obeMMmEVJYo9+X/NhH3MEZTNMRTs0fKH7fUSIKd
pK4RLv7P7rYPRkq3n7qqWauWGIq8mIavyGPFZMoMy9dLwkhDaujw1rTkXDfLyLXp
XhUYRvwDOoFOVvqVPeXFXCVM2u4JYOIk4kovFQXm4QKBgQD4uW5aUnjfmAYO5cRK
8Z9K6zEfbfAH5mFHIjvjSTSuiVvU/WeA3UptN/fQGDk3lHuIk/1d0Twnfeiq7Q9d
TGnnlk++vPxB3ppK6hqH5Lu2LXemOkyr4NJXWTkBpf3S5r4BrQ3PlkLebuwCOeYu
mxMpEgAQZsTB2U9GSDGe3opJYQKBgQDikn4Uqp3CUzTo23tomD4XEk3GpHcHbTj8
OyTXpyXvQRMgtBrVVZ+aa3HUTJLDGQZPd4LTiChXvcObtS8y7WOyIWrkwwSFm5WP
56C4rfAKsmvvigQFdhah/y7/bDbQmJeiFgq6Mu7rXI3pzZ+kgyAHzUFCHsXDQOAh
174uI4zvDQKBgGmQEfUFwcVsOU4DWK9SI4Bhl8S2HUTNE4ZkUjSh8lkNdUtNjatU
wGzgby4Dyez7+P47iTJTRougVaqN2JKJhv1Cf2/9t7ahKq0W9NGuU7j7TSfg4H+m
eL+X36kCcVsckZIWh6EOLi1HuKUtO7OWH6izuhE7/NAlUg8LPvwliV2hAoGBAMCg
VzzuyW07HJKUd1k3hiJLV4B4txHDVF1tUyddXi0JIF//f4i8YRMCIiaia2wfTHQn
YTzCV7oxBarN4bDkjowVSTHwc1m8Ku3LuaMJjjkp9AYVStHx0dAsiiJyODAka1ZM
cxZW0zWa3LRYM0/Eg2jeooq6atxTvbpIF9JWOy3JAoGBAMDf8671lm7K5IK3Lbv/
cYT5py+0wFHCNOkeFfoU4Mnfy9qiPL/eL/5RnbzE6lHB3oHPwLWYbgU2fd34qcXJ
rnqCNbcTict2vcLizlssV81erG0Vt1iyYr4YkUOzz0jRuI0OZxCRIkU3O8ajnkiA
Gh2HAi3orRG9/i378EiDUWW3
-----END PRIVATE KEY-----
`;

export interface ReceivedRequest {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
  receivedAt: number;
}

export interface HttpsReceiver {
  port: number;
  /** `https://127.0.0.1:<port>` */
  url: string;
  requests: ReceivedRequest[];
  close(): Promise<void>;
}

export async function startHttpsReceiver(handler: (req: ReceivedRequest, res: ServerResponse) => void): Promise<HttpsReceiver> {
  const requests: ReceivedRequest[] = [];
  const server: Server = createServer({ cert: CERT, key: KEY }, (req: IncomingMessage, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const received = { method: req.method ?? '', path: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks), receivedAt: Date.now() };
      requests.push(received);
      handler(received, res);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    port,
    url: `https://127.0.0.1:${port}`,
    requests,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
